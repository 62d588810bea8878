"""Reference solutions and engine-driven expected values for the checkers.

Private on purpose: `minillm.grading` does not re-export anything from here and
no exercise notebook imports it, so a learner's namespace never holds an answer.
"""
