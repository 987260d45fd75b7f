"""What the codec tests of every protocol share."""
from queueserver.protocols.base import LOCAL


def only_command(commands):
    """The single command decoded."""
    assert len(commands) == 1, commands
    return commands[0]


def local_reply(command) -> bytes:
    """The answer of a command the codec answers itself."""
    assert command.route == LOCAL, command
    return command.reply


def shape(cmd):
    """What the router sees of a command, lists and tuples alike."""
    if cmd.route == LOCAL:
        return ("local", cmd.reply, cmd.close)
    return (cmd.op, [list(a) if isinstance(a, (list, tuple)) else a for a in cmd.args],
            cmd.route, cmd.key, cmd.new_id)
