"""The job's key-value store (jax.distributed's coordination service) in memory, with the calls
platform/notices.py and checkpoint/agreement.py make, for several threads standing in for hosts."""

import threading


class KeyValueStore:
    def __init__(self):
        self.values: dict[str, str] = {}
        self._changed = threading.Condition()

    def key_value_set(self, key, value, allow_overwrite=False):
        with self._changed:
            if key in self.values and not allow_overwrite:
                raise RuntimeError(f"ALREADY_EXISTS: {key}")
            self.values[key] = value
            self._changed.notify_all()

    def key_value_try_get(self, key):
        with self._changed:
            if key not in self.values:
                raise RuntimeError(f"NOT_FOUND: {key}")
            return self.values[key]

    def key_value_increment(self, key, increment):
        with self._changed:
            n = int(self.values.get(key, "0")) + increment
            self.values[key] = str(n)
            self._changed.notify_all()
            return n

    def blocking_key_value_get(self, key, timeout_in_ms):
        with self._changed:
            if not self._changed.wait_for(lambda: key in self.values, timeout_in_ms / 1000):
                raise RuntimeError(f"DEADLINE_EXCEEDED: {key}")
            return self.values[key]
