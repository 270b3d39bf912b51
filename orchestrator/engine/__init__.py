"""The pipeline engine: stage workers exchanging tensors over TCP, and the coordinator.

Imports neither Flask nor the control plane; it is started as `pipeserve stage` and
`pipeserve coordinator` processes.
"""
