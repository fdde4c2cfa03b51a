"""Training and evaluation of translation models: setups, options, plans, runs, checkpoints and the main job."""
