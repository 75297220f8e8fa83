"""Cluster.guests_on: each node's guests in the cluster's order, grouped once."""

from __future__ import annotations

from opendrs.model.cluster import Cluster, Guest, Node


def test_guests_on_keeps_the_cluster_order_per_node() -> None:
    nodes = (Node("a", 4, 8), Node("b", 4, 8), Node("c", 4, 8))
    placement = ["b", "a", "b", "b", "a", "x"]  # "x": a guest on a node the cluster lacks
    cluster = Cluster(nodes, tuple(Guest(str(i), node) for i, node in enumerate(placement)))
    for name in ("a", "b", "c", "x", "nowhere"):
        expected = tuple(g for g in cluster.guests if g.node == name)
        assert cluster.guests_on(name) == expected
    assert [g.id for g in cluster.guests_on("b")] == ["0", "2", "3"]
    assert cluster.guests_on("c") == ()
    moved = cluster.with_placement({"0": "c"})
    assert [g.id for g in moved.guests_on("c")] == ["0"]
    assert [g.id for g in moved.guests_on("b")] == ["2", "3"]
