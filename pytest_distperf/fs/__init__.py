"""Files and folders, beneath every other layer: the one atomic writer and JSON reader, and safe folders."""
