"""The flood's arms (tools/bench/flood.py): its plan and stack, and each system it runs -
luftpause, the SGLang Model Gateway, vLLM's router (the SGLang router and engine priority
are started with the stack) - then the schedule of arms at every point."""
