"""Language modelling: the LM setups, corpus preparation and the LM training tool."""
