"""The skills library page: writing, compiling and deleting skills."""
