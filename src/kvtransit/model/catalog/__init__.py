"""What exists: models, devices, links, codecs, and the one-line spec texts that describe new ones (pure)."""
