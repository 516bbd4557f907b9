"""Start the parity-ui web app: python app.py [--port N] [--host ADDR] [--db runs.db]."""

from parity_ui.ui import main

if __name__ == "__main__":
    main()
