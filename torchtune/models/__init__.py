"""Model families. Each subpackage has component builders, fixed-size model builders and weight conversion."""
