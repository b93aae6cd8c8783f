"""The heads figure (a weight metric against a behaviour score, one dot per head) and the heads report page."""
