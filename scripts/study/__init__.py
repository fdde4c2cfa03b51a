"""The study tool: grids of training runs, their checks, seeds, statistics, reports and plots."""
