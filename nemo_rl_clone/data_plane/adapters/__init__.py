"""Data-plane engines: `transfer_queue.TQDataPlaneClient` (TransferQueue, the only one built)."""
