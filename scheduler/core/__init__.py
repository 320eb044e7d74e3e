"""Berth's scheduling decisions as plain Python: a snapshot in, decisions out (no Django)."""
