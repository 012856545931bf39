"""What every training run does around its loop: pre-flight and dry run, run state, stopping on signals."""
