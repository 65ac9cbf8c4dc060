"""The code an exported model beyond GPT-2 carries: configuration_gpt_trainer.py and
modeling_gpt_trainer.py are copied byte for byte into the export folder (gpt/checkpoint/
export_custom.py), where transformers loads them with trust_remote_code=True. They import
only torch and transformers, never this package: a machine with transformers alone loads
the folder."""
