"""The bridge to real runs: a torch.distributed harness, fitting, validation, and an emulated
multi-rack cluster (testbed) on one Linux host. Importing this package never imports torch."""
