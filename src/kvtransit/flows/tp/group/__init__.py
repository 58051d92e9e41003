"""A decode instance as a TP group (`kvtransit up --decode-tp N`): decode leads, N − 1 follower ranks all-reduce."""
