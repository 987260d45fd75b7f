"""Numbers longer than Python will parse (over 4300 digits) are numbers
beyond every limit: the protocol's own error, never a dropped connection."""
from __future__ import annotations

from queueserver.protocols.base import HUGE, parse_int
from queueserver.protocols.takeanumber import TakeANumberCodec
from queueserver.protocols.workq import WorkqCodec

from codec_helpers import local_reply, only_command

LONG = b"9" * 5000
ID = b"00000000-0000-4000-8000-000000000001"


def test_parse_int_gives_huge_for_what_python_would_refuse():
    assert parse_int(b"42") == 42 and parse_int(b"-7") == -7
    assert parse_int(b"0" * 5000 + b"12") == 12
    assert parse_int(LONG) == HUGE and parse_int(b"-" + LONG) == -HUGE


def test_workq_refuses_a_huge_number_in_its_own_words():
    assert local_reply(only_command(WorkqCodec().receive(b"lease q " + LONG + b"\r\n"))) \
        == b"-CLIENT-ERROR Invalid wait timeout\r\n"
    assert local_reply(only_command(WorkqCodec().receive(b"add " + ID + b" q " + LONG
                                                         + b" 1000 1\r\nx\r\n"))) \
        == b"-CLIENT-ERROR Invalid TTR\r\n"
    codec = WorkqCodec()
    assert local_reply(only_command(codec.receive(b"add " + ID + b" q 10 1000 1 -priority="
                                                  + LONG + b"\r\nx\r\n"))) \
        == b"-CLIENT-ERROR Invalid Priority\r\n"


def test_takeanumber_refuses_huge_retries():
    reply = local_reply(only_command(TakeANumberCodec().receive(b"ADD q " + LONG + b" body\r\n")))
    assert reply.startswith(b"-ERR")
