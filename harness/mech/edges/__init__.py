"""Edges and paths patched exactly: what a sender writes and how that write changes (`writes`), one
edge at a time with a fast and a reference path (`patching`), routes through MLPs, groups of senders
and several hops (`paths`), and many edges per pass (`batched`, with `sets`: which edges, which
caches, what one costs)."""
