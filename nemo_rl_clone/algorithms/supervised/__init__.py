"""The supervised family's machinery (SFT, DPO, RM): config, setup, the shared step loop."""
