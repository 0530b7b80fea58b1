"""Vocabulary: ids, status codes, the error tree, the configuration schema. Standard library only."""
