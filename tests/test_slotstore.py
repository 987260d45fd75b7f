"""The slot map's record in etcd (``queueserver.cluster.slotstore``), on a real etcd."""
from __future__ import annotations

import threading
from typing import List

import pytest

from queueserver.cluster import slotstore
from queueserver.cluster.clusterfile import EtcdSpec
from queueserver.cluster.coordination import Etcd
from queueserver.placement import SLOTS
from queueserver.cluster.slotstore import SlotTable

from etcd_server import EtcdServer, etcd  # noqa: F401  (the fixture)


def _client(server: EtcdServer) -> Etcd:
    return Etcd(EtcdSpec((server.endpoint,), "/qs-test"))


def test_runs_round_trip_and_cover_every_slot() -> None:
    table = SlotTable.founded([0, 1, 2])
    assert [run[:3] for run in table.runs()] == [[0, 5462, 0], [5462, 10923, 1], [10923, SLOTS, 2]]
    table.set([[100, 200], [7000, 7001]], 3, 5)
    again = SlotTable.decode(table.encode().encode())
    assert list(again.owners) == list(table.owners) and list(again.epochs) == list(table.epochs)
    assert again.owners[150] == 3 and again.epochs[7000] == 5 and again.owners[7001] == 1


@pytest.mark.parametrize("value", [b'{"owners": [[0, 100, 0, 0]]}',
                                   b'{"owners": [[0, 100, 0, 0], [99, 16384, 1, 0]]}',
                                   b'{"owners": [[0, 16385, 0, 0]]}',
                                   b'{"owners": [[0, 16384, -1, 0]]}'])
def test_a_record_that_does_not_cover_the_slots_once_is_refused(value: bytes) -> None:
    with pytest.raises(ValueError):
        SlotTable.decode(value)


def test_older_news_never_undoes_newer() -> None:
    table = SlotTable.founded([0, 1])
    assert table.set([[0, 10]], 1, 7)
    assert not table.set([[0, 10]], 0, 6)
    assert table.owners[5] == 1 and table.epochs[5] == 7


def test_ensure_writes_the_founders_map_once(etcd: EtcdServer) -> None:   # noqa: F811
    client = _client(etcd)
    try:
        assert slotstore.read(client) == (None, 0)
        first = slotstore.ensure(client, [0, 1])
        second = slotstore.ensure(client, [5, 6, 7])   # a later node's view does not replace it
        assert list(second.owners) == list(first.owners)
        assert second.owners[0] == 0 and second.owners[SLOTS - 1] == 1
    finally:
        client.close()


def test_racing_writers_converge_by_epoch(etcd: EtcdServer) -> None:   # noqa: F811
    clients = [_client(etcd) for _ in range(4)]
    try:
        slotstore.ensure(clients[0], [0, 1])
        errors: List[BaseException] = []

        def move(i: int) -> None:
            try:
                for step in range(5):
                    epoch = i * 10 + step + 1
                    slotstore.record(clients[i], [[i * 1000, i * 1000 + 500]], 2 + i, epoch, [0, 1])
                    slotstore.record(clients[i], [[8000, 8010]], 2 + i, epoch, [0, 1])
            except BaseException as err:   # reported below
                errors.append(err)
        threads = [threading.Thread(target=move, args=(i,)) for i in range(4)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert not errors
        table, revision = slotstore.read(clients[0])
        assert table is not None and revision > 0
        for i in range(4):
            assert table.owners[i * 1000] == 2 + i and table.epochs[i * 1000] == i * 10 + 5
        assert table.owners[8005] == 5 and table.epochs[8005] == 35   # the highest epoch won
    finally:
        for client in clients:
            client.close()
