"""The LAN copy: a model's files from peer agents, pipelined, hashed per block and verified."""
