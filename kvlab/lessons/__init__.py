"""Each lesson example's runner and constants, the comparison tables and the course map."""
