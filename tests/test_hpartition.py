"""Tests of remat_dsl.solve.solvers.ilp.hpartition: H-Partition (HiRemate Algorithm 7, thesis Section 3.3).

Property tests run on random DAGs (convexity of every cluster, coverage, size bound,
children in a topological order, determinism, keys that ignore names); the real-graph
tests capture examples/gpt2.py (4 layers) and examples/transformer.py once per module.
"""

from __future__ import annotations

import random
import re
import time
from collections import Counter

import networkx as nx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from remat_dsl.plan import ir
from remat_dsl.solve.solvers.ilp.hpartition import HCluster, forward_dag, h_partition, is_convex

# ---------------------------------------------------------------------------
# Helpers
# ---------------------------------------------------------------------------


def check_partition(dag: nx.DiGraph, root: HCluster, max_size: int) -> None:
    """Every invariant of h_partition's docstring, on one result."""
    order = {u: i for i, u in enumerate(dag.nodes)}
    leaves = root.leaves()
    assert sorted(leaves) == sorted(dag.nodes)  # coverage, each node once
    assert len(set(leaves)) == len(leaves)
    where = {u: i for i, u in enumerate(leaves)}
    assert all(where[u] < where[v] for u, v in dag.edges)  # leaves() is a topological order
    for cluster in root.clusters():
        assert 1 <= len(cluster.children) <= max_size or not dag.number_of_nodes()
        if cluster is not root:
            assert len(cluster.children) >= 2
        assert is_convex(dag, cluster.leaves())
        child_of = {u: j for j, child in enumerate(cluster.children) for u in _leaves(child)}
        for u, v in dag.edges:
            if u in child_of and v in child_of and child_of[u] != child_of[v]:
                assert child_of[u] < child_of[v], "children are not in a topological order"
        # Ordered by first leaf whenever that order is topological.
        firsts = [min(order[u] for u in _leaves(child)) for child in cluster.children]
        by_first = sorted(range(len(firsts)), key=firsts.__getitem__)
        rank = {j: k for k, j in enumerate(by_first)}
        if all(rank[child_of[u]] < rank[child_of[v]] for u, v in dag.edges
               if u in child_of and v in child_of and child_of[u] != child_of[v]):
            assert firsts == sorted(firsts)


def _leaves(unit) -> tuple[str, ...]:
    return unit.leaves() if isinstance(unit, HCluster) else (unit,)


def _shape(root: HCluster):
    """The tree with leaves named by position: equal for renamed copies of a graph."""
    return tuple(_shape(c) if isinstance(c, HCluster) else "leaf" for c in root.children), root.key


@st.composite
def random_dags(draw, max_nodes: int = 40):
    """(dag, value_bytes, labels, max_size): insertion order is a topological order."""
    n = draw(st.integers(0, max_nodes))
    names = draw(st.permutations([f"op{i}" for i in range(n)]))  # names unrelated to order
    dag = nx.DiGraph()
    dag.add_nodes_from(names)
    for i in range(1, n):
        window = draw(st.integers(1, i))
        preds = draw(st.sets(st.integers(max(0, i - window), i - 1), max_size=3))
        for p in sorted(preds):
            dag.add_edge(names[p], names[i])
    value_bytes = {u: draw(st.integers(0, 4096)) for u in names}
    labels = {u: draw(st.sampled_from(["mm", "add", "relu", "norm"])) for u in names}
    max_size = draw(st.integers(2, 7))
    return dag, value_bytes, labels, max_size


def shuffled_edges(dag: nx.DiGraph, seed: int) -> nx.DiGraph:
    """Same nodes in the same order, edges inserted in another order (other adjacency order)."""
    other = nx.DiGraph()
    other.add_nodes_from(dag.nodes)
    edges = list(dag.edges)
    random.Random(seed).shuffle(edges)
    other.add_edges_from(edges)
    return other


# ---------------------------------------------------------------------------
# is_convex (Definition 3.3.1)
# ---------------------------------------------------------------------------


def test_is_convex_on_a_diamond():
    dag = nx.DiGraph([("a", "b"), ("a", "c"), ("b", "d"), ("c", "d")])
    assert is_convex(dag, ["a", "b", "c", "d"])
    assert is_convex(dag, ["b", "c"])  # no path between them
    assert is_convex(dag, ["a", "b"])
    assert not is_convex(dag, ["a", "d"])  # a -> b -> d leaves and re-enters
    assert not is_convex(dag, ["a", "b", "d"])
    assert is_convex(dag, [])


# ---------------------------------------------------------------------------
# Small hand-made graphs
# ---------------------------------------------------------------------------


def _uniform(dag, nbytes=100, label="op"):
    return {u: nbytes for u in dag.nodes}, {u: label for u in dag.nodes}


def test_small_graphs_and_edge_cases():
    empty = nx.DiGraph()
    assert h_partition(empty, {}, {}).children == ()
    single = nx.DiGraph()
    single.add_node("x")
    assert h_partition(single, {"x": 1}, {"x": "op"}).children == ("x",)
    chain = nx.DiGraph()
    nx.add_path(chain, [f"c{i}" for i in range(5)])
    root = h_partition(chain, *_uniform(chain))
    assert root.children == tuple(f"c{i}" for i in range(5))  # fits: no grouping needed
    with pytest.raises(ValueError):
        h_partition(chain, *_uniform(chain), max_size=1)
    with pytest.raises(ValueError):
        h_partition(chain, {"c0": 1}, _uniform(chain)[1])


def test_insertion_order_need_not_be_topological():
    dag = nx.DiGraph()
    dag.add_nodes_from(["late", "early"])
    dag.add_edge("early", "late")
    root = h_partition(dag, *_uniform(dag))
    assert root.leaves() == ("early", "late")


def test_repeated_blocks_get_one_key():
    """A chain of 8 identical residual blocks: the blocks come out as identical clusters."""
    dag = nx.DiGraph()
    prev = "input"
    dag.add_node(prev)
    for k in range(8):
        a, b, c, out = (f"b{k}.{s}" for s in ("a", "b", "c", "add"))
        nx.add_path(dag, [prev, a, b, c, out])
        dag.add_edge(prev, out)
        prev = out
    value_bytes = {u: 1000 if u.endswith("add") or u == "input" else 4000 for u in dag.nodes}
    labels = {u: u.split(".")[-1] for u in dag.nodes}
    root = h_partition(dag, value_bytes, labels, max_size=4)
    check_partition(dag, root, 4)
    keys = Counter(c.key for c in root.clusters())
    assert max(keys.values()) >= 7  # the interior blocks share a key


def test_star_and_isolated_nodes_use_the_fallback():
    star = nx.DiGraph([("hub", f"leaf{i}") for i in range(300)])
    root = h_partition(star, *_uniform(star), max_size=12)
    check_partition(star, root, 12)
    isolated = nx.DiGraph()
    isolated.add_nodes_from(f"n{i}" for i in range(100))
    root = h_partition(isolated, *_uniform(isolated), max_size=5)
    check_partition(isolated, root, 5)
    assert root.leaves() == tuple(f"n{i}" for i in range(100))  # intervals of the order


def test_wraps_of_one_level_never_form_a_cycle():
    """A = {a, a2} and B = {b, b2} are each convex but a -> b, b2 -> a2 makes them a cycle
    if both are wrapped in one level (NOTE: [Sequential wraps])."""
    dag = nx.DiGraph()
    dag.add_nodes_from(["a", "b2", "b", "a2", "x", "y"])
    dag.add_edges_from([("a", "b"), ("b2", "a2"), ("a", "x"), ("a2", "x"), ("b", "y"), ("b2", "y")])
    for max_size in (2, 3, 4, 5):
        check_partition(dag, h_partition(dag, *_uniform(dag), max_size=max_size), max_size)


# ---------------------------------------------------------------------------
# Properties on random DAGs
# ---------------------------------------------------------------------------


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(random_dags())
def test_random_dags_invariants(case):
    dag, value_bytes, labels, max_size = case
    root = h_partition(dag, value_bytes, labels, max_size)
    check_partition(dag, root, max_size)


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(random_dags(), st.integers(0, 10**6))
def test_random_dags_deterministic(case, seed):
    dag, value_bytes, labels, max_size = case
    root = h_partition(dag, value_bytes, labels, max_size)
    assert h_partition(dag, value_bytes, labels, max_size) == root
    # Adjacency order and dict order play no part.
    again = h_partition(shuffled_edges(dag, seed), dict(reversed(value_bytes.items())),
                        dict(reversed(labels.items())), max_size)
    assert again == root


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(random_dags(), st.integers(0, 10**6))
def test_keys_ignore_names(case, seed):
    """Renaming the nodes (same order, same structure) changes neither the tree nor a key."""
    dag, value_bytes, labels, max_size = case
    names = list(dag.nodes)
    fresh = [f"x{i}" for i in range(len(names))]
    random.Random(seed).shuffle(fresh)
    rename = dict(zip(names, fresh))
    renamed = nx.relabel_nodes(dag, rename)
    root = h_partition(dag, value_bytes, labels, max_size)
    other = h_partition(renamed, {rename[u]: b for u, b in value_bytes.items()},
                        {rename[u]: s for u, s in labels.items()}, max_size)
    assert _shape(other) == _shape(root)
    assert other.leaves() == tuple(rename[u] for u in root.leaves())


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(random_dags(max_nodes=25))
def test_keys_see_labels(case):
    dag, value_bytes, labels, max_size = case
    if not dag.number_of_nodes():
        return
    root = h_partition(dag, value_bytes, labels, max_size)
    first = next(iter(dag.nodes))
    changed = h_partition(dag, value_bytes, {**labels, first: "something else"}, max_size)
    assert changed.key != root.key


def test_runs_in_near_linear_time():
    """Guards against quadratic blow-ups (hub nodes, long chains, many levels)."""
    rng = random.Random(0)
    dag = nx.DiGraph()
    for i in range(1000):
        dag.add_node(f"n{i}")
        for _ in range(rng.randint(1, 3) if i else 0):
            j = i - rng.randint(1, min(i, 8)) if rng.random() > 0.05 else rng.randrange(i)
            dag.add_edge(f"n{j}", f"n{i}")
    star = nx.DiGraph([("hub", f"leaf{i}") for i in range(1000)])
    for graph in (dag, star):
        start = time.perf_counter()
        root = h_partition(graph, *_uniform(graph))
        assert time.perf_counter() - start < 8.0  # about 0.4 s and 0.2 s when measured
        assert len(root.leaves()) == graph.number_of_nodes()


# ---------------------------------------------------------------------------
# Real graphs
# ---------------------------------------------------------------------------


def _capture(spec: str) -> ir.Graph:
    from remat_dsl.capture.model_file import load_model_file
    from remat_dsl.capture.pipeline import capture_graph

    return capture_graph(load_model_file(spec), repeats=1, measure_time=False).graph


@pytest.fixture(scope="module")
def gpt2():
    return _capture("examples/gpt2.py")


@pytest.fixture(scope="module")
def transformer():
    return _capture("examples/transformer.py")


def _layers(dag: nx.DiGraph, pattern: str) -> dict[int, frozenset[str]]:
    layers: dict[int, set[str]] = {}
    for u in dag.nodes:
        m = re.match(pattern, u)
        if m:
            layers.setdefault(int(m.group(1)), set()).add(u)
    return {k: frozenset(v) for k, v in sorted(layers.items())}


def test_forward_dag_of_gpt2(gpt2):
    dag, value_bytes, labels = forward_dag(gpt2)
    forward = [op for op in gpt2.ops if op.phase == ir.FORWARD]
    assert list(dag.nodes) == [op.name for op in forward]
    assert nx.is_directed_acyclic_graph(dag)
    tensors = {t.name: t for t in gpt2.tensors}
    op = next(op for op in forward if op.name == "transformer.h.1.attn.add")
    assert set(dag.predecessors(op.name)) == {"transformer.h.1.attn.mul", "transformer.where"}
    assert value_bytes[op.name] == sum(tensors[t].nbytes for t in op.outputs)
    assert labels["transformer.h.0.ln_1"] == labels["transformer.h.3.ln_1"]
    assert labels["transformer.h.0.attn.c_attn"] != labels["transformer.h.0.mlp.c_fc"]
    assert labels[op.name].startswith("aten.add.Tensor(")


def test_gpt2_layers_are_identical_clusters(gpt2):
    """With max_size=10 every layer but the last is exactly one cluster, all with one key.

    The last layer's final residual add has a single reader, ln_f, and that pure chain is
    among the cheapest groups of eq. 3.1, so the last layer's cluster also holds ln_f.
    """
    dag, value_bytes, labels = forward_dag(gpt2)
    root = h_partition(dag, value_bytes, labels, max_size=10)
    check_partition(dag, root, 10)
    by_leaves = {frozenset(c.leaves()): c for c in root.clusters()}
    layers = _layers(dag, r"transformer\.h\.(\d+)\.")
    assert len(layers) == 4
    keys = {by_leaves[layers[k]].key for k in (0, 1, 2)}
    assert len(keys) == 1
    assert layers[3] | {"transformer.ln_f"} in by_leaves


def test_gpt2_default_size_repeats_blocks(gpt2):
    """At the default max_size every layer is cut into the same bottom clusters."""
    dag, value_bytes, labels = forward_dag(gpt2)
    root = h_partition(dag, value_bytes, labels)
    check_partition(dag, root, 12)
    layers = _layers(dag, r"transformer\.h\.(\d+)\.")
    bottoms = [c for c in root.clusters() if not any(isinstance(x, HCluster) for x in c.children)]
    per_layer = []
    for ops in layers.values():
        inside = [c for c in bottoms if set(c.leaves()) <= ops]
        assert sum(len(c.leaves()) for c in inside) >= len(ops) - 1
        per_layer.append(sorted(c.key for c in inside))
    assert all(keys == per_layer[0] for keys in per_layer)
    assert root.depth() <= 4


def test_transformer_partitions_into_convex_clusters(transformer):
    dag, value_bytes, labels = forward_dag(transformer)
    for max_size in (6, 12):
        root = h_partition(dag, value_bytes, labels, max_size)
        check_partition(dag, root, max_size)
    # The two decoder layers share clusters (3.3.5).
    root = h_partition(dag, value_bytes, labels)
    layers = _layers(dag, r"transformer\.decoder\.layers\.(\d+)\.")
    keys = [{c.key for c in root.clusters() if set(c.leaves()) <= ops} for ops in layers.values()]
    assert len(keys) == 2 and keys[0] & keys[1]
