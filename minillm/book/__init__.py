"""The book's tools: figures, the lab, widgets, source rendering, benchmarks
and fidelity studies. Uses the simulator and the core, never the other way."""
