"""Starting and watching Millwright workflows: the ``millwright`` CLI and a small client library."""
