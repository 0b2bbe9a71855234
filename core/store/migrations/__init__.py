"""The schema's migrations, `NNNN_name.sql`, applied in order by core/store/db.py: package data, so an
installed wheel carries them (read through importlib.resources, never a path relative to the sources)."""
