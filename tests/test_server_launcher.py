"""ServerLauncher (servers/launcher.py): a launcher by name or as an object, and the command lines it builds."""
import pytest

from tunekit.errors import TunekitError
from tunekit.servers.launcher import ServerLauncher, StockServerLauncher, WarmServerLauncher


def test_server_launcher_create_takes_names_and_objects():
    warm, stock = ServerLauncher.create("warm"), ServerLauncher.create("stock")
    assert isinstance(warm, WarmServerLauncher) and warm.checks_secret
    assert isinstance(stock, StockServerLauncher) and not stock.checks_secret
    assert ServerLauncher.create(stock) is stock
    with pytest.raises(TunekitError, match="'cold'"):
        ServerLauncher.create("cold")
    cmd = dict(tracker="127.0.0.1:1", key="k", host="127.0.0.1", port=5000)
    assert "tunekit.servers.warm_server" in warm.command(**cmd, gpu=False)
    assert warm.command(**cmd, gpu=True)[-1] == "--check-cuda" and "--check-cuda" not in warm.command(**cmd, gpu=False)
    assert "--no-fork" in stock.command(**cmd, gpu=True) and "--no-fork" not in stock.command(**cmd, gpu=False)
