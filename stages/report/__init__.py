"""What people see: terminal progress, tables."""
