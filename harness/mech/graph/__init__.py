"""The edge graph of a model: its senders, receivers and edge masks (`structure`), what its passes read
(`parts`: the senders' writes, per-head projections), forward passes in which every receiver reads its
own input (`forward`: edge circuits, single-edge patches, gradients; through norms after the attention
too), edges from and into MLPs patched through it (`patches`), and attribution scores (`attribution`:
EAP and EAP-IG)."""
