"""The flows beside the KV hand-off, each a plug-in in a folder of its own."""
