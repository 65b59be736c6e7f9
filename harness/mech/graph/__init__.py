"""The edge graph of a model: its senders, receivers and edge masks (`structure`), forward passes in
which every receiver reads its own input (`forward`: edge circuits, single-edge patches, gradients),
edges from and into MLPs patched through it (`patches`), and attribution scores (`attribution`:
EAP and EAP-IG)."""
