"""Looking inside the models: fill-mask, generation from the masked LM, attention pictures, layer probes."""
