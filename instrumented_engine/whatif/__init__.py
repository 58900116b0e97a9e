"""What-if: recorded requests and their hash chains replayed through the block manager (another cache size, policy
or router), run by run, and our engine's own recorded traffic replayed step for step."""
