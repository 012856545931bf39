"""Game environments: multi-turn episodes where each turn is a move and the environment answers with the new state."""
