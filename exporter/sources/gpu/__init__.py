"""GPU sources: the vendors' supervised children, their pipe protocol, and the merge of vendors."""
