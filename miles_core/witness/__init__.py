"""What a fault's effect looks like in a history: one witness per fault kind.

Both sides read it: the fault_witness oracle judges that every fault that fired took
effect, and a run with until_witnessed goes on while a fault's effect is still missing
(miles_core.stopping). So it sits outside the oracles, which import it, never the
reverse. ``index``: the events the witnesses read; ``idle``: a window that nothing it acts
on passed through; ``effects``: the witness of each kind.
"""
