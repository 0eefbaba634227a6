"""Renderers: console (rich), markdown, json. They read values; they compute nothing new."""

# Load Nsight Compute's report reader before any renderer loads matplotlib: the other
# order crashes the reader (see perfscope.profile.READER_CONFLICTS).
import perfscope.profile  # noqa: F401
