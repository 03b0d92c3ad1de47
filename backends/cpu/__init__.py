"""The CPU backend (python -m backends.cpu): its Stack (torch trainer cells, HTTP engines on
Ray, weights over gloo or shared memory) and its run command."""
