"""View models: pure functions from the control plane's State to what a template shows."""
