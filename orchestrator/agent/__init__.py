"""The node agent (`pipeserve agent`): one per node, driven by the control plane over HTTP.

It reports what the node is and has (`report`, `inventory`), pairs with the control plane
(`state`), advertises itself on the LAN (`discovery`), gets models onto the node
(`transfer`, `sources`), and starts and stops the node's engine processes (`processes`).
`server` is its HTTP API and `client` the control plane's side of it. Nothing here imports
Flask or the control plane; the HTTP API is documented in docs/agent-api.md.
"""
