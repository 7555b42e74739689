"""The suite's order: the seed's own checks first -- ZeRO-3 against FSDP2, where the offloaded optimizer runs (seed
002's NVMe cases among them), then the offloaded pair's step time and memory (host-bound on one GPU: it takes the
most pairs) -- then the collectives and the front-ends. Under a session budget (pyproject's distperf_session_budget,
or --distperf-session-budget) the tests left out when time runs short are then the later, secondary ones."""

ORDER = ("test_zero3.py", "test_offload.py", "test_zero3.py offload", "test_comm.py", "test_lightning.py",
         "test_lightning_18336.py")


def pytest_collection_modifyitems(items):
    def rank(item):
        name = item.path.name
        if name == "test_zero3.py" and "offload" in item.name:
            name += " offload"
        return ORDER.index(name) if name in ORDER else len(ORDER)

    items.sort(key=rank)  # stable: within a file, the file's own order
