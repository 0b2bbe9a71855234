"""What the bot sees and hears: posted images prepared for the main agent's model, and voice turned to text."""
