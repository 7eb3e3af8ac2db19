"""The demo users and their fixed API tokens (no Django import: demo.py reads these).

Demo values, published in the README: never use them outside a local demo.
"""

from __future__ import annotations

DEMO_TOKENS: dict[str, str] = {
    "alice": "alice-demo-token-" + "0" * 23,
    "bob": "bob-demo-token-" + "0" * 25,
}
