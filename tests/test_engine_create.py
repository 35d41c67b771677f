"""Engine.create (clients/engine.py): an engine by name or as an object."""
import pytest

from tunekit.clients.engine import Engine
from tunekit.clients.stock_engine import StockEngine
from tunekit.clients.tunekit_engine import TunekitEngine
from tunekit.errors import TunekitError


def test_engine_create_takes_names_and_objects():
    assert isinstance(Engine.create("tunekit"), TunekitEngine) and Engine.create("tunekit").name == "tunekit"
    assert isinstance(Engine.create("stock"), StockEngine)
    mine = StockEngine()
    assert Engine.create(mine) is mine
    with pytest.raises(TunekitError, match="'turbo'"):
        Engine.create("turbo")
