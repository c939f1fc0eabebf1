"""The notebook pages: the home page (the list, a new notebook, the bundled examples), one
notebook with its fields, errata and placements, and managing notebooks (rename, duplicate, delete)."""
