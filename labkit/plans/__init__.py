"""What a decision is made of, and the arithmetic on it: a plan over a model's blocks (blocks.py) and the
advisor's situation (situation.py). Pure data and sums, no measuring: lab code builds on these types, and the
planners (labkit.planners) measure a model to fill them in."""
