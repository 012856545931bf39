"""NeMo-RL's sequence packers (`algorithms`) and their metrics (`metrics`), at NeMo-RL's paths."""
