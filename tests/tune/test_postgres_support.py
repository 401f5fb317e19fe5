"""The throwaway PostgreSQL server of tests/support/postgres_support.py: it starts, takes writes from two
engines, and is gone (server and files) once the context exits."""

from __future__ import annotations

from pathlib import Path

import postgres_support
import pytest

REASON = postgres_support.unavailable()
pytestmark = pytest.mark.skipif(REASON is not None, reason=REASON or "")


def test_running_postgres_serves_two_engines_and_stops(tmp_path: Path) -> None:
    from sqlalchemy import create_engine, exc, make_url, text

    with postgres_support.running_postgres(tmp_path) as url:
        parsed = make_url(url)
        assert parsed.drivername == "postgresql+psycopg"
        assert parsed.database == postgres_support.DATABASE
        socket_dir = Path(str(parsed.query["host"]))
        assert socket_dir.is_dir()

        first, second = create_engine(url), create_engine(url)
        try:
            with first.begin() as connection:
                connection.execute(text("CREATE TABLE runs (id integer PRIMARY KEY, label text NOT NULL)"))
                connection.execute(text("INSERT INTO runs VALUES (1, 'first')"))
            with second.begin() as connection:
                connection.execute(text("INSERT INTO runs VALUES (:id, :label)"), {"id": 2, "label": "second"})
            with first.connect() as connection:
                rows = connection.execute(text("SELECT id, label FROM runs ORDER BY id")).all()
                assert [tuple(row) for row in rows] == [(1, "first"), (2, "second")]
                assert connection.execute(text("SELECT current_database()")).scalar_one() == "arke_test"
        finally:
            first.dispose()
            second.dispose()

    assert not socket_dir.exists()
    assert (tmp_path / "postgres.log").is_file()
    gone = create_engine(url, connect_args={"connect_timeout": 2})
    try:
        with pytest.raises(exc.OperationalError), gone.connect():
            pass
    finally:
        gone.dispose()


def test_running_postgres_cleans_up_when_the_body_raises(tmp_path: Path) -> None:
    from sqlalchemy import make_url

    with pytest.raises(ZeroDivisionError), postgres_support.running_postgres(tmp_path) as url:
        socket_dir = Path(str(make_url(url).query["host"]))
        _ = 1 / 0
    assert not socket_dir.exists()
    assert not socket_dir.parent.exists()
