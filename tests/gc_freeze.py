"""Imported last by the suite's forkserver (`FORKSERVER_PRELOAD` in tests/conftest.py): the heap its preload built
moves out of the collector's reach, so the full collections of every forked child (an entry point's driver, a rank
of a gloo world) skip it, as in the Ray worker zygote (`nemo_rl_clone.distributed.worker_zygote.serve`)."""

import gc

gc.collect()
gc.freeze()
