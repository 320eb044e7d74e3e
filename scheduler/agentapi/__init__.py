"""The agent protocol, server side (docs/agents.md): one module per message, `register`,
`report`, `lease` and `logs`, with `views` and `urls` for HTTP.

Two streams per agent (protocol 3):
- Reports (`apply_report`) carry every task the agent knows (full state), and the output of
  an ended task inline when it is short. An agent sends them one at a time, so they apply in
  the order the agent saw things. The server validates the whole report before changing
  anything, moves task rows, releases devices of tasks the agent says have stopped, and
  answers with orders (tasks to start and to kill). A repeated report changes nothing more.
- Lease renewals (`renew_lease`, `lease_orders`) keep the node alive and deliver orders; the
  web view holds one open until there are orders for the node (scheduler.notify wakes it).
  A lease changes a task row in one way only: an Assigned task it lists as Running has
  started (so a start costs no report). An old lease body can never undo a newer report.

A task ends on the server only once its output is held: a final report says how many bytes
of output the attempt produced, and until the server holds them the task stays Running and
the answer lists it in `awaiting_output` (the agent ships the rest and reports again).
Job states are derived from task states by the scheduler loop (scheduler/lifecycle/sync.py).
"""
