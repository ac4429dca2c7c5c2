"""The bundled corpus files (see manifest.json); a package so that they install."""
