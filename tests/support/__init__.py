"""Helpers that several test modules share. A test module imports them from here (tests/ is on
sys.path, as for tests/protobuf_reader.py), never from another test module (tests/test_repository.py);
the fixtures they need are in tests/conftest.py."""
