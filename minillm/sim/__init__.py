"""The simulator: FLOPs and bytes, GPU profiles, the cost model, workloads,
and the core scheduler run on a virtual clock."""
