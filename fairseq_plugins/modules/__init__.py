"""Plain ``nn.Module`` building blocks with no registry side effects."""
