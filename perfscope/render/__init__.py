"""Renderers: console (rich), markdown, json. They read values; they compute nothing new."""
